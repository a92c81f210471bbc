"""The timeline's paths, and the rule patterns it names jobs' rules by."""

TIMELINE_DIR = "results/timeline"
TIMELINE = f"{TIMELINE_DIR}/timeline.png"


def rule_output_patterns():
    """Every other rule's outputs as regular expressions (wildcard constraints included),
    shell-quoted JSON {rule: [regex, ...]}: the timeline names each job's rule by them.
    """
    patterns = {
        rule_.name: [output.regex().pattern for output in rule_.output]
        for rule_ in workflow.rules
        if rule_.output and rule_.name != "timeline"
    }
    return as_json(patterns)
