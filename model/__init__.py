"""CapsNet model package. Kept free of imports so `from model.contract import ...` costs no torch."""
