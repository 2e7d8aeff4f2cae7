"""The main job's own steps (scripts/main_job.sh): where its recipes run (`launch`: the GPU where torch sees one, else
the CPU), the TF-IDF baseline (`tfidf`), the comparison table it ends with (`compare`), and a check that two runs of
it computed the same (`compare_runs`). Run from the repository root as `python -m main_job.<name>`; not part of the
installed package."""
