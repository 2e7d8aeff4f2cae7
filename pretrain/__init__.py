"""The pretraining recipe: `python pretrain/run_pretraining.py --help`."""
