from fedclock.cli import main

main()
