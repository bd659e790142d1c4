DROP TABLE generation_jobs;
