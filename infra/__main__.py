"""Entry point of `pulumi up` (Pulumi.yaml: `main: infra/`)."""

from infra.program import config_from_pulumi, define

define(config_from_pulumi())
