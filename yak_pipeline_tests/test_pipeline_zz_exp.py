from yak_pipeline_tests.pipeline_helpers import *  # noqa
from yak_pipeline_tests.pipeline_helpers import pipeline_env  # noqa: F401
import time as _t

def test_exp(pipeline_env, database, openai_server):
    s = pipeline_env
    add_exchange(database, "alice", "I live in Berlin.", DAY)
    add_exchange(database, "alice", "I think I might like jazz.", DAY, minute=1)
    add_exchange(database, "alice", "What's a good movie tonight?", DAY, minute=2)
    inst = new_instance("alice")
    t=_t.time()
    r = run_partition(inst, pipeline_resources(s, llm_base_url=openai_server.base_url), "alice", DAY)
    print("took", _t.time()-t)
    print(r.success, materialized_assets(r))
    for a in ["raw_exchanges","distillations","conflict_scores","distillation_versions"]:
        print(a, materialization_metadata(r, a))
    print([ (e.check_name, e.passed) for e in r.get_asset_check_evaluations()])
    print(fetch_all(database, "select content, confidence, tier, status, needs_review, prompt_version from distillations"))
    t=_t.time()
    r = run_partition(inst, pipeline_resources(s, llm_base_url=openai_server.base_url), "alice", DAY)
    print("took2", _t.time()-t)
