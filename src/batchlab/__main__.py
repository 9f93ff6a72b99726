from batchlab.cli import main

main()
