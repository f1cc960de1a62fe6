module golister

go 1.19
