"""The one Dagster ``Definitions`` object of the Yak code location."""

import warnings

import dagster as dg

# Partitioned asset checks are a preview feature in Dagster 1.13; the gate relies on them.
warnings.filterwarnings("ignore", category=dg.PreviewWarning)

from yak_pipeline.defs.automation.jobs import memory_job, recall_index_job, warmth_job  # noqa: E402
from yak_pipeline.defs.automation.schedules import (  # noqa: E402
    nightly_recall_index_schedule,
    nightly_warmth_schedule,
)
from yak_pipeline.defs.automation.sensors import (  # noqa: E402
    api_inbox_sensor,
    drop_folder_sensor,
    run_failure_alert_sensor,
    turns_sensor,
)
from yak_pipeline.defs.distillations.assets import distillations  # noqa: E402
from yak_pipeline.defs.distillations.checks import distillation_quality  # noqa: E402
from yak_pipeline.defs.exchanges.assets import raw_exchanges  # noqa: E402
from yak_pipeline.defs.resources import default_resources  # noqa: E402
from yak_pipeline.defs.scores.assets import conflict_scores, distillation_versions, warmth  # noqa: E402
from yak_pipeline.settings import get_settings  # noqa: E402

# The code location is an entry point: the one place on the Dagster side that reads the settings.
# The schedules' time zone and every resource's fields come from them, when Dagster loads it.
SETTINGS = get_settings()

ASSETS = [raw_exchanges, distillations, conflict_scores, distillation_versions, warmth]
CHECKS = [distillation_quality]

defs = dg.Definitions(
    assets=ASSETS,
    asset_checks=CHECKS,
    jobs=[memory_job, warmth_job, recall_index_job],
    sensors=[drop_folder_sensor, api_inbox_sensor, turns_sensor, run_failure_alert_sensor],
    schedules=[nightly_warmth_schedule(SETTINGS.timezone), nightly_recall_index_schedule(SETTINGS.timezone)],
    resources=default_resources(SETTINGS),
)
