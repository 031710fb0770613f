"""The user's verbs: the CLI, the ordered stage list and its cache, the server launcher and client, the
load tester. The top floor: imports the other packages, none imports it."""
