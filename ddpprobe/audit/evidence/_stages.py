"""The stages an audit runs and what each one reads, defined once (pure Python)."""

from __future__ import annotations

from typing import Optional

#: Stages an audit can run (each is the Trainer method of that name).
STAGES = ("validate", "fit", "test", "predict")

#: The loop (``batch`` event ``stage``) whose samples a stage's keys are computed from.
STAGE_LOOP = {"validate": "val", "test": "test", "predict": "predict", "fit": "train"}

#: The loop a hook runs in, by the word its name holds (``training_step`` -> ``"train"``), in this order.
HOOK_LOOP = (("train", "train"), ("validation", "val"), ("test", "test"), ("predict", "predict"))


def loop_of_hook(hook: str) -> Optional[str]:
    """The loop (``"train"``, ``"val"``, ``"test"``, ``"predict"``) whose hook ``hook`` is, or None."""
    return next((loop for word, loop in HOOK_LOOP if word in hook), None)


#: The key of the stage's loader in a data factory's dict (``{"train": ..., "val": ...}``).
DATA_KEY = {"validate": "val", "test": "test", "predict": "predict", "fit": "train"}

#: The ``LightningModule`` / ``LightningDataModule`` method that gives the stage's loader.
LOADER_METHOD = {
    "fit": "train_dataloader",
    "validate": "val_dataloader",
    "test": "test_dataloader",
    "predict": "predict_dataloader",
}

#: The ``Trainer`` attribute holding each loop's loaders after a run.
TRAINER_LOADERS = {
    "train": "train_dataloader",
    "val": "val_dataloaders",
    "test": "test_dataloaders",
    "predict": "predict_dataloaders",
}
