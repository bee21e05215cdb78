"""``torchrun ... -m ddpprobe.launch SCENARIO``: run one scenario in an externally launched world.

See ddpprobe/launch/_external.py ``main``.
"""

import sys

from ddpprobe.launch._external import main

sys.exit(main())
