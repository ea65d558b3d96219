"""The one error a checkpoint that cannot be served raises at start."""


class CheckpointError(ValueError):
    """A checkpoint this backend cannot serve; the message names the file and the field."""
