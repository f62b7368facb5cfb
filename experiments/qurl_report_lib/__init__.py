"""The pieces of experiments/qurl_report.py, one concern a module.

Lowest first; a module imports only those before it:
  stats     mean ± std over seeds, the paired bootstrap, the verdict rule,
            number formatting;
  studies   a study's run files on disk: loading, pooling, archiving,
            per-run summaries;
  gates     what a claim may say: the arms' effective configs (the UAQ
            scale applied), the fields two arms differ in, and the "not
            tested / not exercised / not attributable" gates of issue 44;
  claim_list  what is claimed: the configs each question compares, the
            fields they may differ in, the studies' markers;
  claims    the claims table: the verdict of each claim;
  fair_test Q6's pre-registered readouts (the KL slope beside held-out
            accuracy) and Q7's, each verdict beside its exposure, the A/A
            floor and Q6's calibration;
  sections  the page's other sections and its figures.

experiments/qurl_report.py (flags and main) puts experiments/ on sys.path
and imports them as `qurl_report_lib.<module>`.
"""
