# Sourced by benchmarks/run_on_gpu.sh, run_compute_on_gpu.sh, run_triton_on_gpu.sh and run_main_job_on_gpu.sh:
# installs the wheels found in .whl/ into /tmp/site (without touching the environment) and sets the variables they
# all need (the repository on PYTHONPATH, the Hub offline, unbuffered output).
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
