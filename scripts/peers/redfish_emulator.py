"""Starts sushy-tools' Redfish emulator with a fixed power-change delay and in-memory state.

The fake systems driver applies a power change after a random 1-11 s. Tests need it short and
predictable, so REDFISH_POWER_DELAY_S (whole seconds) replaces the random draw.

The driver keeps its systems in a SQLite file, and requests the tests make in parallel fight over its
lock: a write that waits more than 5 s is answered HTTP 500 "database is locked". The emulator is one
process living as long as one test run, so its systems live in a dict instead (the driver persists only
a store that can be made permanent, which a dict cannot).

Arguments are passed to the emulator's own command line (--config, --interface, --port).
"""

import os
import sys
import types

from sushy_tools.emulator.resources.systems import fakedriver

_DELAY = os.environ.get("REDFISH_POWER_DELAY_S")
if _DELAY is not None:

    class _FixedDelay:
        @staticmethod
        def randint(_low, _high):
            return int(_DELAY)

    fakedriver.random = _FixedDelay

fakedriver.memoize = types.SimpleNamespace(PersistentDict=dict)

from sushy_tools.emulator.main import main  # noqa: E402

sys.exit(main())
