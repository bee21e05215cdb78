"""Which hooks a rank entered: the trace's ``hook`` events (the first entry of each hook) and its ``hooks`` event
(how often each was entered, written when the trace closes).

Lightning runs every module, datamodule and callback hook through three functions of its ``trainer/call.py``
(``_call_lightning_module_hook``, ``_call_lightning_datamodule_hook``, ``_call_callback_hooks``), and decides there
or in its connectors which ranks run a hook (``prepare_data`` runs on local rank 0 only:
``trainer/connectors/data_connector.py``). While a trace is open those three are wrapped in this process; the
wrappers count, then call the original.
"""

from __future__ import annotations

import functools
import importlib

#: The functions of Lightning's ``trainer/call.py`` that run hooks, and what each hook belongs to.
_RUNNERS = {
    "_call_lightning_module_hook": "module",
    "_call_lightning_datamodule_hook": "datamodule",
    "_call_callback_hooks": "callbacks",
}


class HookCounter:
    """Counts the hooks this rank enters while installed; the first entry of each is written at once."""

    def __init__(self, write):
        self.write = write
        self.counts: dict = {}
        self._originals: dict = {}
        self._module = None

    def install(self) -> None:
        from ddpprobe import _lightning

        self._module = importlib.import_module(f"{_lightning.pl.__name__}.trainer.call")
        for name, owner in _RUNNERS.items():
            original = getattr(self._module, name, None)
            if original is None:
                continue
            self._originals[name] = original
            setattr(self._module, name, self._wrap(original, owner))

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            setattr(self._module, name, original)
        self._originals.clear()
        self.write("hooks", counts=self.counts)

    def _wrap(self, original, owner: str):
        counter = self

        @functools.wraps(original)
        def run(trainer, hook_name, *args, **kwargs):
            label = f"{owner}.{hook_name}"
            if label not in counter.counts:
                counter.counts[label] = 0
                counter.write("hook", hook=hook_name, owner=owner)
            counter.counts[label] += 1
            return original(trainer, hook_name, *args, **kwargs)

        return run
