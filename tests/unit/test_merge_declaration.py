"""The Merge declaration of rebalanced(): each misfit is refused in one line naming it,
before any Spark work (the declaration is checked against the schemas only)."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from rebalance import Merge
from rebalance.streaming.keyed_state import ContractError

TYPES = {"user_id": StringType(), "window_start": TimestampType(), "clicks": LongType(),
         "pages": ArrayType(StringType()), "first_click": TimestampType()}


def _schema(*names: str) -> StructType:
    return StructType([StructField(n, TYPES[n]) for n in names])


OUTPUT = _schema("user_id", "window_start", "clicks", "pages", "first_click")
INPUT = ["user_id", "page", "click_time"]


def test_a_declaration_that_names_every_column_once_fits():
    merge = Merge(on=["user_id", "window_start"], sum="clicks", max=["pages"],
                  min="first_click", split_by=("page", "click_time"))
    with pytest.raises(ContractError, match="min and max take ordered scalar columns"):
        merge.check(OUTPUT, INPUT)
    fitting = _schema("user_id", "window_start", "clicks", "first_click")
    Merge(on=["user_id", "window_start"], sum="clicks", min="first_click",
          split_by=("page", "click_time")).check(fitting, INPUT)


@pytest.mark.parametrize("merge, message", [
    (dict(on=[]), "Merge needs on"),
    (dict(on=["user_id", ""]), "Merge on must be column names"),
    (dict(on="user_id", sum=[3]), "Merge sum must be column names"),
])
def test_a_malformed_declaration_is_refused(merge, message):
    with pytest.raises(ContractError, match=message):
        Merge(**merge)


@pytest.mark.parametrize("merge, message", [
    (Merge(on=["user_id", "window_start"], sum=["clicks", "user_id"], min="first_click",
           max="pages"), "names output column 'user_id' twice"),
    (Merge(on=["user_id", "window_start"], sum=["clicks", "views"], min="first_click",
           max="pages"), r"names \['views'\], not columns of the output schema"),
    (Merge(on=["user_id", "window_start"], sum="clicks"),
     r"does not say how output column\(s\) \['pages', 'first_click'\] combine"),
    (Merge(on=["user_id", "window_start"], sum=["clicks", "first_click"], max="pages"),
     "Merge sums 'first_click', of type timestamp; sum takes numeric columns"),
    (Merge(on=["user_id", "window_start"], sum="clicks", min="first_click", max="pages"),
     "the min or max of 'pages', of type array<string>"),
])
def test_a_declaration_that_does_not_fit_the_output_is_refused(merge, message):
    with pytest.raises(ContractError, match=message):
        merge.check(OUTPUT, INPUT)


def test_split_by_must_name_columns_of_the_stream():
    fitting = _schema("user_id", "clicks")
    with pytest.raises(ContractError, match=r"split_by \['event_id'\] are not columns"):
        Merge(on="user_id", sum="clicks", split_by="event_id").check(fitting, INPUT)
