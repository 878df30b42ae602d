import os
import sys

# suite.py and the helper scripts live next to the tests.
sys.path.insert(0, os.path.dirname(__file__))
