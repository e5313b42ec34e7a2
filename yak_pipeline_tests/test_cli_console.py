"""What `yak up` and the other commands print for a person: a quiet console and whole table rows."""

from __future__ import annotations

import dagster as dg
import pytest
from dagster._core.instance.config import dagster_instance_config
from rich.table import Table

from yak_pipeline.cli.dagster_runtime import SHIPPED
from yak_pipeline.cli.pipeline import service_banner
from yak_pipeline.cli.render import PIPED_WIDTH, make_console
from yak_pipeline.settings import Settings
from yak_pipeline_tests.conftest import PROJECT_ROOT


def test_the_banner_names_the_offline_rules_provider_and_the_embedder() -> None:
    llm, embedder = service_banner(Settings(embedder="hashing"))
    assert "offline rules provider" in llm and "YAK_LLM_BASE_URL unset" in llm
    assert embedder.startswith("embedder:") and "feature-hashing-384 (384 dimensions" in embedder


def test_the_banner_names_the_llm_endpoint_without_its_password() -> None:
    llm, _ = service_banner(Settings(embedder="hashing", llm_base_url="http://me:hunter2@127.0.0.1:11434/v1",
                                     llm_model="llama3.1:8b"))
    assert llm.split(None, 1)[1] == "llama3.1:8b at http://me:***@127.0.0.1:11434/v1"


def test_the_instance_config_is_valid_quiets_runs_and_has_no_first_visit_pop_up(
    capfd: pytest.CaptureFixture[str],
) -> None:
    config, _ = dagster_instance_config(str(PROJECT_ROOT))  # validated against Dagster's own schema
    assert config["nux"] == {"enabled": False}

    @dg.op
    def say(context):  # noqa: ANN001, ANN202 - Dagster reads the annotation, a string under __future__
        context.log.info("3 stored, 2 rejected")
        context.log.debug("detail nobody asked for")

    @dg.job
    def chatty() -> None:
        say()

    instance = dg.DagsterInstance.ephemeral(settings={"python_logs": config["python_logs"]})
    assert chatty.execute_in_process(instance=instance).success
    printed = capfd.readouterr()
    output = printed.out + printed.err
    assert "3 stored, 2 rejected" in output
    assert "detail nobody asked for" not in output and "STEP_START" not in output and "RUN_SUCCESS" not in output


def test_piped_tables_keep_each_row_on_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    console = make_console()  # pytest's captured stdout is no terminal, as a pipe is not
    assert console.width == PIPED_WIDTH
    grid = Table("id", "user", "content")
    grid.add_row("0b7c1f7e-6a7e-4a51-9a43-0f7c0c0d3a11", "demo", "The user is planning a trip to Lisbon in spring")
    with console.capture() as captured:
        console.print(grid)
    rows = [line for line in captured.get().splitlines() if "demo" in line]
    assert len(rows) == 1 and "trip to Lisbon in spring" in rows[0]


def test_yak_up_reads_the_projects_dagster_yaml_and_examples_as_package_data() -> None:
    """In a checkout, yak_pipeline/shipped/ links to the project's files (a wheel carries copies)."""
    assert (SHIPPED / "dagster.yaml").read_bytes() == (PROJECT_ROOT / "dagster.yaml").read_bytes()
    examples = {p.name: p.read_bytes() for p in (PROJECT_ROOT / "examples" / "drop").iterdir()}
    assert examples and {p.name: p.read_bytes() for p in (SHIPPED / "examples" / "drop").iterdir()} == examples
