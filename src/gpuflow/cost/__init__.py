"""What a job costs: its work counted from its inputs and settings (`work`, and each family's
`work` module), rates measured on a device (`rates`, `calibrate`), the time they predict
(`predict`), the time limit it sets (`limits`) and what a run spent against it (`ledger`)."""
