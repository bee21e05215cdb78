"""The audit's third room, the contract and the registry: from the evidence to verdicts and causes, each a
hazard of the registry (ddpprobe/hazards/) or a field of the DDP contract (ddpprobe/contract/) that breaks. A
key's verdict (``_verdict``, its words in ``_kinds``; why values differ from single-process in ``_differs``, and
from rank to rank or not synced in ``_rank_local``), the fixes a registry entry allows (``_fixes``), the
contract's breaks and the comparisons with one process (``_contract``), and the problems grouped by root cause
(``_findings``)."""
