"""The trigger form's checks: each Param's range, choices and section, as the config schema gives
them, and Airflow's Param validation refusing what they exclude. The expectations are read from the
schema independently of the form: from the JSON Schema pydantic makes of each config field."""

from __future__ import annotations

from typing import Literal, get_args, get_origin

import pytest
from airflow.sdk.definitions.param import ParamsDict
from airflow.sdk.exceptions import ParamValidationError
from pydantic import BaseModel

from include import trigger_form
from pipeline.config import PipelineConfig
from pipeline.config_files import DEFAULT_CONFIG_PATH, read_yaml
from pipeline.deployment import is_deployment_setting
from pipeline.overrides import config_names, field_annotation

RANGE = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
# A value past each kind of bound: below a minimum, the bound itself for an exclusive one.
PAST = {"minimum": -1, "exclusiveMinimum": 0, "maximum": 1, "exclusiveMaximum": 0}
PARAM_OF = {field: name for name, (field, _) in trigger_form.FIELDS.items()}


def json_schema(field: str) -> dict:
    """The JSON Schema pydantic makes of a config field: {"type": "integer", "minimum": 1, ...}."""
    *sections, key = field.split(".")
    model: type[BaseModel] = PipelineConfig
    for section in sections:
        model = model.model_fields[section].annotation
    return model.model_json_schema()["properties"][key]


def checks(schema: dict) -> dict:
    return {keyword: value for keyword, value in schema.items() if keyword in (*RANGE, "enum")}


def is_choice(field: str) -> bool:
    return get_origin(field_annotation(field.split("."))) is Literal


def form() -> ParamsDict:
    """The form as the DAG makes it, its defaults pipeline.yaml's."""
    return ParamsDict(trigger_form.params(read_yaml(DEFAULT_CONFIG_PATH)))


@pytest.mark.parametrize("field", PARAM_OF)
def test_a_field_has_the_range_and_choices_of_its_config_field(field):
    assert checks(form().get_param(PARAM_OF[field]).schema) == checks(json_schema(field))


BOUNDS = [
    (field, keyword, bound) for field in PARAM_OF for keyword, bound in json_schema(field).items() if keyword in RANGE
]


def test_the_form_has_ranges_to_check():
    checked = {field for field, _, _ in BOUNDS}
    assert {"train.max_steps", "train.learning_rate", "generate.top_p", "data.block_size"} <= checked


@pytest.mark.parametrize("field, keyword, bound", BOUNDS)
def test_airflow_refuses_a_value_past_a_bound_and_takes_the_yaml_default(field, keyword, bound):
    params = form()
    params.validate()  # pipeline.yaml's values
    name = PARAM_OF[field]
    with pytest.raises(ParamValidationError, match=f"^Invalid input for param {name}: .* the (minimum|maximum) of"):
        params[name] = bound + PAST[keyword]
    if keyword in ("minimum", "maximum"):
        params[name] = bound
        assert params[name] == bound


CHOICES = [field for field in config_names() if is_choice(field) and not is_deployment_setting(field)]


def test_every_choice_a_run_has_is_in_the_form():
    assert {"generate.strategy", "data.val_split"} <= set(CHOICES)
    assert set(CHOICES) <= set(PARAM_OF)


@pytest.mark.parametrize("field", CHOICES)
def test_a_choice_is_a_drop_down_of_its_literals_values(field):
    params, name = form(), PARAM_OF[field]
    values = list(get_args(field_annotation(field.split("."))))
    assert params.get_param(name).schema["enum"] == values
    assert params[name] in values
    params[name] = values[-1]
    with pytest.raises(ParamValidationError, match=f"^Invalid input for param {name}: 'none' is not one of"):
        params[name] = "none"


@pytest.mark.parametrize(
    "field, section",
    [
        ("corpus", "data"),
        ("run_name", "data"),
        ("tokenizer.vocab_size", "data"),
        ("data.val_split", "data"),
        ("embedding.dim", "model"),
        ("model.n_head", "model"),
        ("train.learning_rate", "training"),
        ("generate.top_p", "generation"),
    ],
)
def test_a_field_is_in_the_section_of_its_config_section(field, section):
    assert form().get_param(PARAM_OF[field]).schema["section"] == section


def test_every_field_is_in_one_of_the_four_sections():
    sections = {form().get_param(name).schema["section"] for name in PARAM_OF.values()}
    assert sections == {"data", "model", "training", "generation"}


def test_the_form_has_four_sections_and_one_for_the_overrides():
    sections = {name: param.schema["section"] for name, param in form().items()}
    assert set(sections.values()) == {"data", "model", "training", "generation", "other"}
    assert [name for name, section in sections.items() if section == "other"] == [trigger_form.OVERRIDES]


def test_a_decimal_field_takes_a_whole_number():
    params = form()
    params["top_p"] = 1  # as an API call's conf may send it
    assert params["top_p"] == 1 and params.get_param("top_p").schema["type"] == "number"
