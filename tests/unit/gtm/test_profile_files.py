from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from gtm.errors import ConfigError
from gtm.gpu_profiles import (
    LLAMA_8B,
    PROFILES,
    ModelKind,
    ProfileSource,
    get_profile,
    roofline_profiles,
    shipped,
)
from gtm.profile_files import (
    load_catalog,
    main,
    operator_catalog,
    read_file,
    render,
    render_shipped,
    shipped_dir,
)

#: The built-in table as it was before profiles became files (every field, floats as
#: repr), written from the code at that commit.
BEFORE_FILES = Path(__file__).parent / "data" / "builtin_profiles_before_files.json"

GOOD = """\
format: gtm.gpu-profile/v1
gpu_type: TPU-v5
model: acme/model-13b
tensor_parallel: 2
source: measured with vllm bench, 2026-11
prefill:
  tokens_per_s: 12000
decode:
  weight_read_s: 0.012
  kv_read_s_per_token: 5.0e-08
kv_cache: {bytes_per_token: 163840, num_gpu_blocks: 20000}
max_model_len: 32768
"""


def _fields(profile: object) -> dict[str, object]:
    return {
        k: repr(v) if isinstance(v, float) else str(v) if isinstance(v, ModelKind) else v
        for k, v in dataclasses.asdict(profile).items()  # type: ignore[call-overload]
    }


def test_shipped_files_reproduce_the_former_built_in_table_to_the_bit() -> None:
    before = json.loads(BEFORE_FILES.read_text())
    assert len(before) == 21
    for key, fields in before.items():
        gpu, model = key.split("|")
        assert _fields(get_profile(gpu, model)) == fields, key


def test_shipped_files_are_the_roofline_derivation(tmp_path: Path) -> None:
    derived = {(p.gpu_type, p.model): p for p in roofline_profiles()}
    assert dict(PROFILES) == derived
    # And regenerating them changes nothing.
    assert main(["--write", str(tmp_path)]) == 0
    for path in sorted(shipped_dir().glob("*.yaml")):
        assert (tmp_path / path.name).read_text() == path.read_text(), path.name
    assert {p.name for p in tmp_path.iterdir()} == set(render_shipped(roofline_profiles()))


def test_every_shipped_profile_comes_from_a_shipped_file() -> None:
    entries = list(shipped())
    assert {e.source for e in entries} == {ProfileSource.SHIPPED}
    assert all(Path(e.origin).parent == shipped_dir() for e in entries)


def test_a_good_file_reads_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "tpu.yaml"
    path.write_text(GOOD)
    [profile] = read_file(path)
    assert (profile.gpu_type, profile.model, profile.tensor_parallel) == (
        "TPU-v5",
        "acme/model-13b",
        2,
    )
    assert profile.prefill_tokens_per_s == 12000.0
    assert profile.block_size == 16
    assert profile.prefix_caching
    assert profile.kind is ModelKind.GENERATE
    assert profile.step_overhead_s == 0.002


def test_several_documents_and_a_directory_over_the_shipped_ones(tmp_path: Path) -> None:
    h100 = dataclasses.replace(get_profile("H100", LLAMA_8B), prefill_tokens_per_s=1234.5)
    (tmp_path / "a.yaml").write_text(GOOD + "---\n" + render(h100, "ours"))
    (tmp_path / "notes.txt").write_text("not a profile")
    catalog = operator_catalog([tmp_path])
    assert catalog.get("h100", LLAMA_8B).prefill_tokens_per_s == 1234.5
    entry = catalog.entry("H100", LLAMA_8B)
    assert entry is not None
    assert entry.source is ProfileSource.FILE
    assert entry.origin == str(tmp_path / "a.yaml")
    assert catalog.get("tpu-v5", "acme/model-13b").tensor_parallel == 2
    a100 = catalog.entry("A100-80GB", LLAMA_8B)
    assert a100 is not None
    assert a100.source is ProfileSource.SHIPPED
    assert operator_catalog([]) is shipped()


def test_render_reads_back_exactly(tmp_path: Path) -> None:
    for profile in list(roofline_profiles())[:12]:
        path = tmp_path / "one.yaml"
        path.write_text(render(profile, "test"))
        assert read_file(path) == [profile]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("  tokens_per_s: 12000", "  tokens_per_s: -5"), r":7: prefill\.tokens_per_s: "),
        (("  tokens_per_s: 12000", "  tokens_per_s: fast"), r"prefill\.tokens_per_s: .*'fast'"),
        (("tensor_parallel: 2", "tensor_parallel: 0"), r":4: tensor_parallel: "),
        (("gpu_type: TPU-v5\n", ""), r"gpu_type: Field required"),
        (("max_model_len: 32768", "max_model_len: 32768\nspeed: 3"), r":13: speed: Extra"),
        (("format: gtm.gpu-profile/v1", "format: v2"), r":1: format: "),
        (("max_model_len: 32768", "max_model_len: 999999999"), r"exceeds the KV cache"),
        (("model: acme/model-13b", "model: ''"), r":3: model: "),
        (("decode:", "decode: [1, 2]\nx:"), r"decode: "),
        (("prefill:", "prefill: !!python/object:os.system\n  x: 1\ny:"), r"tag"),
    ],
)
def test_a_bad_file_names_the_file_line_and_field(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    path = tmp_path / "bad.yaml"
    old, new = change
    path.write_text(GOOD.replace(old, new))
    with pytest.raises(ConfigError, match=message) as info:
        read_file(path)
    assert str(info.value).startswith(str(path))


def test_a_pair_given_twice_names_both_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "b.yml").write_text(GOOD.replace("TPU-v5", "tpu-V5"))
    with pytest.raises(ConfigError, match=r"b\.yml: .*also in .*a\.yaml"):
        load_catalog([tmp_path], source=ProfileSource.FILE)


def test_missing_and_empty_paths_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no profile files"):
        operator_catalog([tmp_path])
    with pytest.raises(ConfigError, match="no such profile file"):
        operator_catalog([tmp_path / "nope.yaml"])
    (tmp_path / "x.yaml").write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        operator_catalog([tmp_path])


def test_the_readme_example_is_a_valid_profile(tmp_path: Path) -> None:
    readme = Path(__file__).parents[3] / "zone_agent" / "README.md"
    text = readme.read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.yaml"
    path.write_text(example)
    [profile] = read_file(path)
    assert (profile.gpu_type, profile.tensor_parallel) == ("B300", 2)


MEASURED = """\
format: gtm.gpu-profile/v1
gpu_type: H100
model: meta-llama/Llama-3.1-8B-Instruct
prefill:
  measured:
{prefill}
decode:
  measured:
{decode}
kv_cache: {{bytes_per_token: 131072, num_gpu_blocks: 25650}}
batching: {{max_num_seqs: 1024, max_num_batched_tokens: 8192}}
max_model_len: 131072
"""


def _measured(prefill: list[int], decode: list[tuple[int, int]]) -> str:
    h100 = get_profile("H100", LLAMA_8B)
    return MEASURED.format(
        prefill="\n".join(
            f"    - {{prompt_tokens: {n}, seconds: {h100.prefill_time_s(n)!r}}}" for n in prefill
        ),
        decode="\n".join(
            f"    - {{batch: {b}, context_tokens: {c}, step_s: {h100.decode_step_s(b, c)!r}}}"
            for b, c in decode
        ),
    )


def test_measured_times_are_fitted_to_the_roofline(tmp_path: Path) -> None:
    """Times measured on a GPU that follows the roofline give its figures back."""
    h100 = get_profile("H100", LLAMA_8B)
    path = tmp_path / "measured.yaml"
    path.write_text(_measured([1024, 4096, 8192], [(1, 1024), (16, 2048), (64, 1024)]))
    [fitted] = read_file(path)
    assert fitted.prefill_tokens_per_s == pytest.approx(h100.prefill_tokens_per_s, rel=1e-6)
    assert fitted.attention_s_per_pair == pytest.approx(h100.attention_s_per_pair, rel=1e-4)
    assert fitted.weight_read_s == pytest.approx(h100.weight_read_s, rel=1e-6)
    assert fitted.kv_read_s_per_token == pytest.approx(h100.kv_read_s_per_token, rel=1e-4)
    # One point each: no attention term, no KV term — the rest still priced sensibly.
    path.write_text(_measured([2048], [(1, 0)]))
    [one] = read_file(path)
    assert one.prefill_tokens_per_s == pytest.approx(h100.prefill_tokens_per_s, rel=0.05)
    assert one.attention_s_per_pair == 0.0
    assert one.weight_read_s == pytest.approx(h100.weight_read_s)
    assert one.kv_read_s_per_token == 0.0


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (r"prefill:\n", "prefill:\n  tokens_per_s: 5\n", "either"),
        (r"decode:\n", "decode:\n  weight_read_s: 0.01\n", "either"),
        (r"seconds: [0-9.e-]+", "seconds: 0.0001", "prefill.measured: the times are not longer"),
        (r"step_s: [0-9.e-]+", "step_s: 0.001", "decode.measured: the steps are not longer"),
    ],
)
def test_bad_measurements_are_named(tmp_path: Path, old: str, new: str, message: str) -> None:
    path = tmp_path / "measured.yaml"
    path.write_text(re.sub(old, new, _measured([1024, 4096], [(1, 1024), (8, 1024)])))
    with pytest.raises(ConfigError, match=message) as info:
        read_file(path)
    assert str(info.value).startswith(str(path))
