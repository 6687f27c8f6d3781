"""Tests of the testkit (atomr.testkit) beyond the probe: fault injection."""
