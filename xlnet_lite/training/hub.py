"""`--push_to_hub`: the run's final outputs, without its checkpoints, uploaded to the Hugging Face Hub."""

from __future__ import annotations

from pathlib import Path

from .arguments import RecipeArguments
from .run import RUN_FILE


def push_output_dir(args: RecipeArguments, *, commit_message):
    """Upload output_dir (the model with its code, tokenizer, results, plots; not the checkpoints) to the Hub."""
    from huggingface_hub import HfApi

    api = HfApi(token=args.hub_token)
    repo_id = api.create_repo(args.hub_model_id or Path(args.output_dir).name, exist_ok=True).repo_id
    api.upload_folder(
        repo_id=repo_id,
        folder_path=args.output_dir,
        commit_message=commit_message,
        ignore_patterns=["checkpoints/*", "checkpoints/**", ".*", RUN_FILE],
    )
    return repo_id
