"""`xlaport verify`: run the original and the converted program and compare."""
