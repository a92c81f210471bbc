"""The fluency-toxicity family: perplexity, toxicity, their correlation, figures and a report."""
