"""The pieces of experiments/qurl_report.py, one concern a module.

Lowest first; a module imports only those before it:
  stats     the readout, seed-level intervals and one-sided tests, Holm's
            adjustment, the A/A noise floor, the verdict rules, number
            formatting;
  studies   a study's run files on disk: loading, pooling, archiving,
            per-run summaries, the readout's per-problem scores;
  gates     what a claim may say: the arms' effective configs (the UAQ
            scale applied, the data order), the fields two arms differ
            in, the "not tested / not exercised / not attributable" gates,
            Q6's calibration and the rule that picks a cap C;
  claim_list  what is claimed: the configs each question compares, the
            fields they may differ in, the studies' markers, the
            deviations from their registered plans;
  exposures the exposure beside each claim (A → B);
  claims    the claims table: each claim's readout difference, tests and
            verdict after the gates;
  fair_test Q6's and Q9's KL-slope readouts and Q6/Q7/Q9 blocks, each
            verdict beside its exposure, the noise floor, the calibration;
  family    every test on the page adjusted together, then the verdicts;
  replay    the mechanism replay's analysis and its section of the page;
  sections  the page's other sections and its figures.

experiments/qurl_report.py (flags and main) puts experiments/ on sys.path
and imports them as `qurl_report_lib.<module>`.
"""
