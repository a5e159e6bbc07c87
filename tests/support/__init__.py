"""What the tests share that is not a fixture: data and image makers, servers, test hosts, the
scripts ranks run, and helpers (docs/tests.md, "Adding a test")."""
