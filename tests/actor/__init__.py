"""Tests of the actor runtime (atomr.actor) and the testkit."""
