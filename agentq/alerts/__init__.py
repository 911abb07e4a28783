"""Where health-check alerts go: Slack (Block Kit), or the log when Slack is not set up."""
