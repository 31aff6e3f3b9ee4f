"""The orchestrator: pipelines, nodes and placement (routing state), behind a REST API."""
