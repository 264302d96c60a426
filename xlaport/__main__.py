from xlaport.cli import entry

entry()
