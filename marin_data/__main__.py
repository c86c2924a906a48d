from marin_data.cli import main

main()
