"""The work-queue fleet: a queue, a template and a group of workers, made once and torn down once."""
