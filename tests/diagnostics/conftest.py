import os
import sys

# make tests/diagnostics/diag_synthetic.py importable
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
