from perflab.cli import main

main()
