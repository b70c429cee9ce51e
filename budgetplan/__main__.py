from budgetplan.cli import main

main()
