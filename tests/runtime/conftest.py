"""Make the shared helpers of the runtime tests (`helpers.py`) importable from the modules here."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
