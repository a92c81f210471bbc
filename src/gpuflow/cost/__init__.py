"""What a job costs: its work, rates, predicted time, time limit and what it spent."""
