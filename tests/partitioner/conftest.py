"""Make the shared helpers of the partitioner tests (`partition_helpers.py`) importable.

The helpers module is not called `helpers.py`: tests/helpers.py has that name, and with
pytest's default import mode both would share one `helpers` module.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
