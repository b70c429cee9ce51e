"""Table layout: numbers align right, text aligns left."""

from budgetplan.cli.render import results_table


def test_numbers_right_text_left():
    table = results_table("t", ["name", "epsilon", "share", "detail"],
                          [["a", 1.5, "12.5%", "hash, schema and numbers hold"], ["b", None, "-", "2 of 3 steps"]])
    assert [c.justify for c in table.columns] == ["left", "right", "right", "left"]
