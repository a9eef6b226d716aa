"""One Pulumi ComponentResource per platform piece."""
