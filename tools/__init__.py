"""The project's tools: demos, report writers and checks that are not the contract or the suite."""
