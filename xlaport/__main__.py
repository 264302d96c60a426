from xlaport.cli import main

main()
