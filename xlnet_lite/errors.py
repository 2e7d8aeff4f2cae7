"""The error a recipe shows as one line: bad flags, files or data, named by the flag, file or column."""


class RecipeError(ValueError):
    """Bad flags, files or data: the message names the flag, file or column. Recipes print it as one line."""
