"""The user's verbs: the CLI, the ordered stage list and its cache, the servers' lifecycle, the client, the OpenAI frontend, the
load tester. The top floor: imports the other packages, none imports it."""
