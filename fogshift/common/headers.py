"""HTTP headers of a shipped checkpoint, shared by the node agent and the orchestrator.

A checkpoint travels between agents through the orchestrator as an archive body (``GET`` /
``PUT .../checkpoint``); what describes it rides in these headers. Both ends name them from
here, below both of them, so that the migration procedure (run by the orchestrator) does not
import the agent's service to learn them.
"""

from __future__ import annotations

#: The archive's sha256 (lower-case hex): the receiver refuses a body that does not match.
SHA_HEADER = "X-Fogshift-Sha256"
#: The checkpoint's ``{"batch", "offset"}`` as JSON.
INFO_HEADER = "X-Fogshift-Checkpoint"
