"""The plain data types that cross rooms, and their JSON form.

Nothing else in scout-sys defines a wire format: ``diagnose --json``, ``watch --json``, saved reports
and the dashboard all serialise these records (schema ``scout-sys/diagnosis/v1``), and the Job has one
codec for the report and for what agents send (``model_job.py``).

Every record is frozen: consensus is a pure function of them.
"""

from __future__ import annotations

# The vocabulary is split in five modules to keep each readable; this one re-exports the others
# (``X as X``) so that ``from scout_sys.model import X`` names any record.
from scout_sys.model_activity import (
    STATES as STATES,
)
from scout_sys.model_activity import (
    Activity as Activity,
)
from scout_sys.model_activity import (
    CollectiveWait as CollectiveWait,
)
from scout_sys.model_activity import (
    RankView as RankView,
)
from scout_sys.model_core import ATTRIBUTED as ATTRIBUTED
from scout_sys.model_core import COLLECTIVES as COLLECTIVES
from scout_sys.model_core import DESYNC as DESYNC
from scout_sys.model_core import HANG as HANG
from scout_sys.model_core import HARDWARE as HARDWARE
from scout_sys.model_core import INCONCLUSIVE as INCONCLUSIVE
from scout_sys.model_core import MAIN_THREAD as MAIN_THREAD
from scout_sys.model_core import PROCESS_EXIT as PROCESS_EXIT
from scout_sys.model_core import PROCESS_STALL as PROCESS_STALL
from scout_sys.model_core import SCHEMA as SCHEMA
from scout_sys.model_core import SDC as SDC
from scout_sys.model_core import STACK as STACK
from scout_sys.model_core import STRAGGLER as STRAGGLER
from scout_sys.model_core import Diagnosis as Diagnosis
from scout_sys.model_core import Evidence as Evidence
from scout_sys.model_core import Frame as Frame
from scout_sys.model_core import Incident as Incident
from scout_sys.model_core import Observation as Observation
from scout_sys.model_core import ProcSample as ProcSample
from scout_sys.model_core import StackSample as StackSample
from scout_sys.model_core import ThreadStack as ThreadStack
from scout_sys.model_job import (
    Job as Job,
)
from scout_sys.model_job import (
    LayoutSource as LayoutSource,
)
from scout_sys.model_job import (
    Rank as Rank,
)
from scout_sys.model_records import (
    CollectiveSample as CollectiveSample,
)
from scout_sys.model_records import (
    DeviceRound as DeviceRound,
)
from scout_sys.model_records import (
    DeviceSample as DeviceSample,
)
from scout_sys.model_records import (
    ExitRecord as ExitRecord,
)
from scout_sys.model_records import (
    Fingerprint as Fingerprint,
)
from scout_sys.model_records import (
    KernelResult as KernelResult,
)
from scout_sys.model_records import (
    OomRecord as OomRecord,
)
from scout_sys.model_records import (
    ProcessGroupSample as ProcessGroupSample,
)
from scout_sys.model_records import (
    SchedSample as SchedSample,
)
from scout_sys.model_records import (
    SignalRecord as SignalRecord,
)
from scout_sys.model_records import (
    ThreadSched as ThreadSched,
)
from scout_sys.model_watch import WATCH_KEY as WATCH_KEY
from scout_sys.model_watch import Event as Event
from scout_sys.model_watch import Snapshot as Snapshot
from scout_sys.model_watch import with_job as with_job
