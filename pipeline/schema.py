"""The index layout sira writes (``mappings/index.json``): its field names and the lifecycle
of a document's ``sira.status``, in one place.

    pending ──(a job marks it)──> queued ──(the model answered, stored)──> proposed
        │                            │                                        │
        │                            └──(model or engine failure)──> failed   │
        └──────────────── `sira enrich` sends pending ones itself ──────────> │
                                                          apply (DF filter) ──> enriched

A ``failed`` document is sent again by later jobs until ``SIRA_WORKER__MAX_DOC_ATTEMPTS``;
a ``proposed`` or ``enriched`` one only when its content or the prompt changed.
"""

from __future__ import annotations

PENDING, QUEUED, PROPOSED, ENRICHED, FAILED = "pending", "queued", "proposed", "enriched", "failed"
PROPOSED_STATES = (PROPOSED, ENRICHED)  # proposals stored for the current content

TEXT_FIELD = "contents"  # title + text of a document as one field (copy_to)
ENRICHED_FIELD = "enriched"  # title + text + both enrichment classes as one field (copy_to)
ECHO_FIELD, BRIDGE_FIELD = "enrich_echo", "enrich_bridge"  # the filtered enrichment per class
PROPOSED_TERMS = "proposed_terms"  # normalised proposals (keyword), for aggregations
