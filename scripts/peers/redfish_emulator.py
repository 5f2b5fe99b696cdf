"""Starts sushy-tools' Redfish emulator with a fixed power-change delay.

The fake systems driver applies a power change after a random 1-11 s. Tests need it short and
predictable, so REDFISH_POWER_DELAY_S (whole seconds) replaces the random draw. Arguments are passed
to the emulator's own command line (--config, --interface, --port).
"""

import os
import sys

from sushy_tools.emulator.resources.systems import fakedriver

_DELAY = os.environ.get("REDFISH_POWER_DELAY_S")
if _DELAY is not None:

    class _FixedDelay:
        @staticmethod
        def randint(_low, _high):
            return int(_DELAY)

    fakedriver.random = _FixedDelay

from sushy_tools.emulator.main import main  # noqa: E402

sys.exit(main())
