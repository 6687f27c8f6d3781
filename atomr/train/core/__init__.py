"""The training core: the model, losses, optimizers, clipping, checkpoints,
data, validation and the messages every trainer answers. No actors live here."""
