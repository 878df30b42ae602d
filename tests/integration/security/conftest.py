import os
import sys

# The scenario's actors and the frame tap live next to this file; workers inherit sys.path.
sys.path.insert(0, os.path.dirname(__file__))
