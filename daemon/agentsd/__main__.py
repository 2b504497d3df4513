from agentsd.main import main

main()
