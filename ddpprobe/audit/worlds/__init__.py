"""The audit's first room, running the worlds: the inputs checked in the caller's process (``_inputs``), the rank
side of a run (``_scenario``, with the one-process first step of ``_reference``), the worlds one audit runs
(``_run``) and the value that holds them (``_worlds``). What comes out is records and traces; the next room
(``ddpprobe.audit.evidence``) reads them."""
