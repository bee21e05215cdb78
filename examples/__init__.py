"""Example LightningModules for ``ddpprobe audit``: the seed question's F1 module, and its correction.

Run them with::

    python -m ddpprobe audit examples.seed_f1_module:make_model --data examples.seed_f1_module:make_data
    python -m ddpprobe audit examples.corrected_f1_module:make_model --data examples.corrected_f1_module:make_data
"""
