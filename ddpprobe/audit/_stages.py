"""The stages an audit runs and what each one reads, defined once (pure Python)."""

#: Stages an audit can run (each is the Trainer method of that name).
STAGES = ("validate", "fit", "test", "predict")

#: The loop (``batch`` event ``stage``) whose samples a stage's keys are computed from.
STAGE_LOOP = {"validate": "val", "test": "test", "predict": "predict", "fit": "train"}

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
